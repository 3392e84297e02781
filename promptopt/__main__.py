from promptopt.cli import main

main()
