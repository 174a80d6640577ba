"""Elastic training without a framework: the committed state and its reset cycle, the elastic loop, and the
checksummed checkpoint store."""
