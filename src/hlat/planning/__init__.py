"""Planning a run before it starts: per-rank memory (memory), predicted step time and cost
(throughput, forecast, calibration), the layout search and HLAT's own comparison (`hlat plan`)."""
