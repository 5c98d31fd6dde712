from hlat.cli import entry

entry()
