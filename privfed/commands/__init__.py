"""The commands: ``python -m privfed.tradeoff``, ``python -m privfed.attack`` and ``python -m privfed.flower``.

Each command is a package or module here (:mod:`~privfed.commands.tradeoff`,
:mod:`~privfed.commands.attack`, :mod:`~privfed.commands.flower`); what they share sits beside
them: the flags and their help (:mod:`~privfed.commands.options`, importable in a blink so that
``--help`` loads nothing else), typed values of flags and config files
(:mod:`~privfed.commands.values`), signals, checkpoints and kept runs
(:mod:`~privfed.commands.signals`) and the parsers, result folders and one-line errors every
command uses (:mod:`~privfed.commands.common`).  Results are written by :mod:`privfed.results`.

The commands are the top layer of the project: they may import everything below them
(``privfed``'s library, :mod:`mechanisms`, :mod:`attacks`), and nothing below imports them.
``privfed.tradeoff`` and ``privfed.attack`` are the public entry points users type.
"""
