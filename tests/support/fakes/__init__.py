"""Stand-ins for servers the tests cannot reach, behaving as the real ones do for the
endpoints the project uses."""
