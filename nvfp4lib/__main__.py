"""`python -m nvfp4lib`: the command line (:mod:`nvfp4lib.study.cli`)."""
from nvfp4lib.study.cli import main

if __name__ == "__main__":
    raise SystemExit(main())
