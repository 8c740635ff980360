"""Site data: layout readers, preprocessing, cache, splits, onboarding checks."""
