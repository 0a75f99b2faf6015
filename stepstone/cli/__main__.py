from stepstone.cli.main import main

main()
