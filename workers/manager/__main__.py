"""`python -m workers.manager --executor E --model BASE --bind ENDPOINT`."""

from workers.manager.broker import main

if __name__ == "__main__":
    raise SystemExit(main())
