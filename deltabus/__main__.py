from deltabus.cli import main

main()
