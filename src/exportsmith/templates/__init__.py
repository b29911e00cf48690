"""Modules that generation copies into the generated package as they are (they run there, not in exportsmith)."""
