"""deploy/ needs pydantic and PyYAML. `make test`'s .venv has both; a GPU machine's own
Python (make test-gpu) may not, and these CPU-only tests are then not collected there."""

import importlib.util

_HAVE_DEPS = all(importlib.util.find_spec(m) for m in ("pydantic", "yaml"))
collect_ignore_glob = [] if _HAVE_DEPS else ["test_*.py"]
