from deltabus.adapters.cli import main

main()
