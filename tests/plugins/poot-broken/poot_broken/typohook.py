from poot import hookimpl


@hookimpl
def poot_exectuor(device):  # misspelled: pluggy would register it and never call it
    return None
