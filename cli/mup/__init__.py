"""The programs of the μP studies (docs/mup.md): the coordinate check and the learning-rate transfer
experiment, behind scripts/coord_check.py and scripts/mup_transfer.py."""
