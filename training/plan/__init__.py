"""`cstack plan`: what a training layout costs per GPU before any GPU is rented.

``plan`` is the cost model and the CLI's entry (``plan(config)``), ``muon_step`` the
optimizer step it predicts rank by rank, ``parts`` the data both use, ``report`` the text,
``calibration.yaml`` the throughputs (each stated as measured or assumed). Import from the
defining module; this file imports nothing.
"""
