"""The leaves every layer reads: errors a user can act on, file writing, how names and sizes are
shown, progress bars, the kinds of recorded figures, the schema version, the devices and
operating rules a setting may name, the reliability threshold, the per-site normalization, and
the site manifests. Nothing here imports another medfed package."""
