from flux_cluster.cli import main

main()
