"""Deprecated path: ``SampleLedger`` is ``hvdsync.torch.SampleLedger`` and ``hvdsync.tensorflow.SampleLedger``.
Imported from here it warns, naming the adapter, until hvdsync 0.4.0; hvdsync imports it from
:mod:`hvdsync.core.elastic._ledger`, a private module so that the product's own imports never warn."""
from hvdsync.core._moved import to_adapters

__getattr__ = to_adapters(__name__, {'SampleLedger': 'hvdsync.core.elastic._ledger'}, until="0.4.0")
