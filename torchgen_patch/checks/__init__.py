"""Checks: version-counter verification of the plan's ops on a device, the
cross-check of a scan against the running dispatcher, and the check of a
generated directory against the plan."""
