"""The guided tour behind `twinrun demo`."""
