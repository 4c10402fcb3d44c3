"""TLS settings of the gRPC and RESTful front ends."""

from mindspore_serving.common.check_type import check_bool, check_str


class SSLConfig:
    """Server certificate and key (PEM files); `verify_client=True` requires client certificates signed by `custom_ca`.

    Args:
        certificate (str): path of the server certificate chain.
        private_key (str): path of the server private key.
        custom_ca (str, optional): path of the CA certificates used to verify clients; required with verify_client.
        verify_client (bool): whether clients must present a certificate.
    """

    def __init__(self, certificate, private_key, custom_ca=None, verify_client=False):
        check_str("certificate", certificate)
        check_str("private_key", private_key)
        check_bool("verify_client", verify_client)
        if verify_client:
            check_str("custom_ca", custom_ca)
        self.certificate = certificate
        self.private_key = private_key
        self.custom_ca = custom_ca
        self.verify_client = verify_client
