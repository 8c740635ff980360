"""medfed on Flower 1.42: a ServerApp and a ClientApp that drive the same server and site code as
the in-process engine (:mod:`medfed.federation.coordinator`, :mod:`medfed.federation.site`).

- :mod:`medfed.flower.server_app`: rounds, aggregation and the run directory, on the SuperLink;
  it reaches the sites through :mod:`medfed.flower.link` (what each message carries, one
  exchange a round), :mod:`medfed.flower.messenger` (sending, waiting, finding the sites) and
  :mod:`medfed.flower.reuse` (weights a site already holds, named by their hash);
- :mod:`medfed.flower.client_app`: one hospital's SuperNode; its scans never leave it (the
  work itself is in :mod:`medfed.flower.client_work`);
- :mod:`medfed.flower.secure`: secure aggregation of the rounds' updates with SecAgg+;
- :mod:`medfed.flower.node`: what a SuperNode keeps on its own disk between messages;
- :mod:`medfed.flower.deploy`: the Flower app folder and the pilot's certificates and keys.
"""
