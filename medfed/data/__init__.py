"""Site data: layout readers, decoding, preprocessing, cache, splits, onboarding checks,
site distances, data cards and the modality registry (what differs between fundus and CT)."""
