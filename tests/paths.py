"""Where the repository and the test data are, for tests in any folder."""

from pathlib import Path

TESTS = Path(__file__).resolve().parent
ROOT = TESTS.parent
