"""The ten procedural task families of Terminal-v0, one module each (``VARIANTS``: name -> draft builder),
and ``common`` (the ``Draft`` record and shell-command helpers they share). ``generator.FAMILIES`` names them."""
