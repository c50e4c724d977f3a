"""Fuzz tests of pgtasks' public boundary (hypothesis); see docs/fuzzing.md."""
