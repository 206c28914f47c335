"""A module that fails on import (tests/data/bad_user_models/02-*.toml)."""

import a_package_that_is_not_installed  # noqa: F401
