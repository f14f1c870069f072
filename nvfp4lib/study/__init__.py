"""The study layer: what the notebooks compute and plot (reports, claims, the headline, figures, the rounds as
commands) and the command line. It imports the core and the bench."""
