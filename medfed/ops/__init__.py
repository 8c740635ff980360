"""Running medfed as a hospital's IT department runs a service: systemd units for the routing
service, the PACS inboxes and the dashboard (:mod:`medfed.ops.units`)."""
