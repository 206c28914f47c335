from tpbench.cli import main

main()
