import pytest


def pytest_addoption(parser):
    parser.addoption(
        "--update-fixtures", action="store_true", help="Rewrite the expected .out.py files from the current codemods."
    )


@pytest.fixture
def update_fixtures(request) -> bool:
    return request.config.getoption("--update-fixtures")
