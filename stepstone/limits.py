"""Documented limits (README "Limits"), enforced with clear errors."""

MAX_STEP_OUTPUT_BYTES = 4 * 1024 * 1024
MAX_EVENT_BYTES = 512 * 1024
MAX_STEPS_PER_RUN = 1000
MAX_EVENT_NAME_CHARS = 512
MAX_EVENT_DEPTH = 64  # nesting of an event's data (objects and arrays)
MAX_STEP_ID_CHARS = 512
MAX_SLEEP_SECONDS = 366 * 86400
DEDUPE_WINDOW_SECONDS = 24 * 3600
MAX_REQUEST_BYTES = 4 * 1024 * 1024  # HTTP request bodies (a list of events, a bulk job)
MAX_ERROR_TEXT_BYTES = 64 * 1024  # a stored error's message, and its traceback, each (cut, not refused)
MAX_ERROR_TYPE_BYTES = 1024  # a stored error's type name (cut, not refused)
MAX_TRANSACTION_SECONDS = 5.0  # a step.transaction's function, run while the commit's transaction is open
MAX_PUSH_BYTES = 64 * 1024 * 1024  # an invocation request or answer of a function served over HTTP
DEFAULT_MAX_STATE_BYTES = 32 * 1024 * 1024  # a run's stored step outputs, summed (max_state=)
