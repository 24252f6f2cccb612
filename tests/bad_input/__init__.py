"""Bad inputs and faults, one test file per area (a package: its file names repeat those of other folders)."""
