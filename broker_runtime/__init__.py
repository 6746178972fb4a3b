"""The broker side of mqaudit: store, remoting, name servers, brokers and clients."""
