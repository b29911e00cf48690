import os
import shutil
import tempfile

import pytest


def pytest_configure(config):
    # Hermetic: the content-hash cache of this run starts empty and never touches the user's cache
    os.environ["EXPORTSMITH_CACHE_DIR"] = tempfile.mkdtemp(prefix="exportsmith-test-cache-")


def pytest_unconfigure(config):
    # ...and is deleted with it: a run leaves nothing behind in the temporary directory
    cache = os.environ.pop("EXPORTSMITH_CACHE_DIR", None)
    if cache:
        shutil.rmtree(cache, ignore_errors=True)


def pytest_addoption(parser):
    parser.addoption(
        "--update-fixtures", action="store_true", help="Rewrite the expected .out.py files from the current codemods."
    )


@pytest.fixture
def update_fixtures(request) -> bool:
    return request.config.getoption("--update-fixtures")
