"""What should happen, decided without I/O. At the top, what a pass decides with (the Tenant
model, the planner, verdicts and conditions, reasons, errors, settings); by subject below it:
``clusters`` (discovery and credentials), ``charts``, ``rollouts`` and ``trust``. Everything
here is pure and unit-tested exhaustively; no module imports a client, a process or a clock it
was not given."""
