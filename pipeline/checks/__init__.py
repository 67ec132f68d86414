"""Data checks (the validate stage): the report, the Great Expectations adapter, the corpus and shard suites."""
