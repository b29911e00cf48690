"""What an error says and where it points, in one line each, for records and reports."""

import traceback
from pathlib import Path


def first_line(error: BaseException) -> str:
    """The exception's type and first line (two when the first only introduces the second, as validators' do)."""
    lines = [line.strip() for line in str(error).strip().splitlines() if line.strip()]
    if not lines:
        return type(error).__name__
    text = " ".join(lines[:2]) if lines[0].endswith(":") and len(lines) > 1 else lines[0]
    return f"{type(error).__name__}: {text}"


USER_PACKAGES = ("transformers", "generated")


def user_location(error: BaseException, packages: tuple[str, ...] = USER_PACKAGES) -> str | None:
    """`package/.../file.py:line` of the innermost frame in transformers or a generated package (`packages` names
    them), along the error's chain of causes (torch re-raises model errors from its own frames)."""
    found = None
    seen = set()
    while error is not None and id(error) not in seen:
        seen.add(id(error))
        for frame in traceback.extract_tb(error.__traceback__):
            path = package_path(frame.filename, packages)
            if path is not None:
                found = f"{path}:{frame.lineno}"
        error = error.__cause__ or error.__context__
    return found


def package_path(filename: str, packages: tuple[str, ...] = USER_PACKAGES) -> str | None:
    """`package/.../file.py` of a file inside one of `packages` (the last directory of that name on its path, so a
    checkout named `transformers` holding `src/transformers` gives the package's path), None for any other file."""
    parts = Path(filename).parts
    for package in packages:
        if package in parts[:-1]:
            index = len(parts) - 1 - parts[:-1][::-1].index(package) - 1
            return Path(*parts[index:]).as_posix()
    return None
