"""Results: writing them (record), where they came from (provenance), what they claim (claims),
and the papermill runner behind `make reproduce` (runner)."""
