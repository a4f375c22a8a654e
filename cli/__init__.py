"""The root ``chatsync`` command (``cli.main``): composes the sub-apps of the other packages."""
