"""Feature-deletion coding tasks: build, scrub, prove no leak, score.

Import from the defining module; this file imports nothing, so ``cstack --help`` does not
import the builder's dependencies.
"""
