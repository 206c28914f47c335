"""A module that never finishes importing (tests/test_harden_user_code.py)."""

import time

time.sleep(3600)


def hook(state, bucket):  # pragma: no cover - never reached
    raise AssertionError
