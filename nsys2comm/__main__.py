"""``python -m nsys2comm``: the same as the ``nsys2comm`` command."""

from .cli import main

if __name__ == "__main__":
    main()
