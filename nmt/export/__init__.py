"""Export of a run's model for other runtimes: a CTranslate2 model directory and an Argos Translate package."""
