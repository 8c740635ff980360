"""New scans from a hospital's PACS: the routing service, the DICOMweb and DICOM inboxes, and
the answers written back beside each study."""
