"""The fleet page (SPEC O16): a read-only web page of the operator's fleet, served beside the
operator's process from what it already holds in memory. It asks no cluster anything."""
