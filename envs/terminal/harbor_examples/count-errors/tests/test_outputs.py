"""Checks of the count-errors task (plain asserts: runs with or without pytest)."""

import hashlib
from pathlib import Path

LOG_SHA256 = "474075e3d8cd0271ffe5de2a77130c9c43ae9c719c77e5ed11c430a89d734fe7"


def test_log_untouched():
    assert hashlib.sha256(Path("/app/server.log").read_bytes()).hexdigest() == LOG_SHA256


def test_error_count():
    assert Path("/app/reports/error_count.txt").read_text().strip() == "3"


if __name__ == "__main__":
    test_log_untouched()
    test_error_count()
