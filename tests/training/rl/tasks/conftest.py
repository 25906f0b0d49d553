"""The fixture repository's own tests run only inside task builds, never in this suite."""

collect_ignore = ["fixture_repo"]
