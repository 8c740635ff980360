"""New scans from a hospital's PACS: the routing service, the DICOMweb and DICOM inboxes, and
the answers written back beside each study."""

# The routing service's default limits (medfed serve --max-bytes, --max-pixels, --max-files).
MAX_BYTES = 200 * 10**6  # one request, and a zipped series unpacked
MAX_PIXELS = 100 * 10**6  # one image's pixels, or one volume's voxels
MAX_FILES = 2000  # files in one zipped series
