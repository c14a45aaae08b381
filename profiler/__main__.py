from .cli import main_entry

main_entry()  # one place for the exit code and a reader that stops early (| head)
