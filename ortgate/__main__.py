from ortgate.cli.main import console

console()
