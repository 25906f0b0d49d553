"""Deploy: the `cstack` command line and the local stack runner (`cstack up`)."""
