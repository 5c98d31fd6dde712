"""Hooks that only tests use: nothing here acts unless a test sets its environment variables
(faults.py: HLAT_FAULT and HLAT_FAULT_MARKER). Imported by the code paths the tests strike."""
