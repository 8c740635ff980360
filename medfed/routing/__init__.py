"""What training and routing need of a trained federation: the bundle (weights and what was
fitted with them), abstention, the routers, the routing posterior, the evaluation and scan
reading. No clinical workflow here: that is :mod:`medfed.clinic`."""
