"""What is applied and measured: the user's script run again with a change, and read back.

- ``trial``: one bounded run of the script in a child process, fixes applied, read
  back as a saved report (NOTE [ Trial lifecycle ]);
- ``tune``: the search behind ``loadprof tune``, trials planned and run in turn;
- ``compare``: the runs behind ``loadprof compare``, one whole run per variant;
- ``codechange``: the winning change as a diff of the user's file;
- ``check``: the gate behind ``loadprof check``, a saved report against limits.

These compute; the terminal tables and the pages of their results are renderers in
report/ (``tune_text``, ``compare_text``, ``pages``). Importing this package imports
none of them: a command loads the one it runs.
"""
