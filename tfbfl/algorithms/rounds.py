"""The one signature every tfbfl round computation has."""

import tensorflow_federated as tff


def round_computation(server_type, client_state_type, seed_type, data_type):
  """Decorator: a `tff.federated_computation` of

      (server value @SERVER, client states @CLIENTS, seeds @CLIENTS, data @CLIENTS)

  as used by `next` and `evaluate` of every algorithm (see `tfbfl.round_loop`).
  Client data come last on purpose: TFF's mergeable-context argument splitter
  takes the client count from the last argument, and clients would silently be
  dropped otherwise (remote execution, `tfbfl.runtime.RemoteRuntime`).
  """
  return tff.federated_computation(tff.FederatedType(server_type, tff.SERVER),
                                   tff.FederatedType(client_state_type, tff.CLIENTS),
                                   tff.FederatedType(seed_type, tff.CLIENTS),
                                   tff.FederatedType(data_type, tff.CLIENTS))
