"""Integrations of pgtasks with other frameworks, each an optional extra: `pgtasks.contrib.django`."""
