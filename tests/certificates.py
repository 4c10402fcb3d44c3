"""Throw-away CAs and certificates (openssl) for the TLS tests."""

import os
import subprocess


def _openssl(directory, *args):
    subprocess.run(["openssl", *args], cwd=directory, check=True, capture_output=True)


def _make_ca(directory, name="ca"):
    _openssl(
        directory,
        "req",
        "-x509",
        "-newkey",
        "rsa:2048",
        "-nodes",
        "-keyout",
        f"{name}.key",
        "-out",
        f"{name}.crt",
        "-days",
        "2",
        "-subj",
        f"/CN=test-{name}",
    )


def _sign(directory, name, common_name, alt_names, ca="ca"):
    _openssl(
        directory,
        "req",
        "-newkey",
        "rsa:2048",
        "-nodes",
        "-keyout",
        f"{name}.key",
        "-out",
        f"{name}.csr",
        "-subj",
        f"/CN={common_name}",
    )
    with open(os.path.join(directory, f"{name}.ext"), "w") as ext:
        ext.write(f"subjectAltName={alt_names}\n")
    _openssl(
        directory,
        "x509",
        "-req",
        "-in",
        f"{name}.csr",
        "-CA",
        f"{ca}.crt",
        "-CAkey",
        f"{ca}.key",
        "-CAcreateserial",
        "-out",
        f"{name}.crt",
        "-days",
        "2",
        "-extfile",
        f"{name}.ext",
    )


def make_certs(directory):
    """A CA with a server certificate (localhost, 127.0.0.1) and a client certificate."""
    _make_ca(directory)
    for name in ("server", "client"):
        _sign(directory, name, "client" if name == "client" else "localhost", "DNS:localhost,IP:127.0.0.1")
    return {
        name: os.path.join(directory, name)
        for name in ("ca.crt", "server.crt", "server.key", "client.crt", "client.key")
    }


def make_host_certs(directory, ips, ca="ca"):
    """A CA `ca` and one certificate per host ip (its subjectAltName), as the hosts of an internal channel have:
    {ip: (certificate, key)}, and the CA's certificate under "ca"."""
    _make_ca(directory, ca)
    paths = {"ca": os.path.join(directory, f"{ca}.crt")}
    for ip in ips:
        name = f"{ca}-host-{ip}"
        _sign(directory, name, ip, f"IP:{ip}", ca)
        paths[ip] = (os.path.join(directory, f"{name}.crt"), os.path.join(directory, f"{name}.key"))
    return paths


CLUSTER_PASSWORDS = {"server": "Cluster-server-pw1", "client": "Cluster-client-pw1"}


def make_cluster_ssl(directory, ips):
    """MindSpore's TLS for the cluster channel (ms_cluster.cluster_ssl_settings): a CA with the extensions
    MindSpore checks (CA:TRUE, key ids; RSA keys of 3072 bits, as its OpenSSL refuses 2048), a server and a client
    certificate for `ips` as PKCS#12 files with passwords, and the SSL JSON naming them. Returns the environment
    that turns it on."""
    import json

    config = os.path.join(directory, "cluster_ca.cnf")
    with open(config, "w") as stream:
        stream.write(
            "[req]\ndistinguished_name=dn\nprompt=no\n[dn]\nCN=cluster-test-ca\n"
            "[v3_ca]\nbasicConstraints=critical,CA:TRUE\nkeyUsage=critical,keyCertSign,cRLSign\n"
            "subjectKeyIdentifier=hash\n"
            "[leaf]\nbasicConstraints=CA:FALSE\nkeyUsage=critical,digitalSignature,keyEncipherment\n"
            "extendedKeyUsage=serverAuth,clientAuth\nsubjectKeyIdentifier=hash\n"
            "authorityKeyIdentifier=keyid,issuer\nsubjectAltName=" + ",".join(f"IP:{ip}" for ip in ips) + "\n"
        )
    _openssl(
        directory,
        "req",
        "-x509",
        "-newkey",
        "rsa:3072",
        "-nodes",
        "-keyout",
        "cluster_ca.key",
        "-out",
        "cluster_ca.pem",
        "-days",
        "2",
        "-config",
        config,
        "-extensions",
        "v3_ca",
    )
    paths = {}
    for role, password in CLUSTER_PASSWORDS.items():
        name = f"cluster_{role}"
        _openssl(
            directory,
            "req",
            "-newkey",
            "rsa:3072",
            "-nodes",
            "-keyout",
            f"{name}.key",
            "-out",
            f"{name}.csr",
            "-subj",
            f"/CN=cluster-{role}",
        )
        _openssl(
            directory,
            "x509",
            "-req",
            "-in",
            f"{name}.csr",
            "-CA",
            "cluster_ca.pem",
            "-CAkey",
            "cluster_ca.key",
            "-CAcreateserial",
            "-out",
            f"{name}.pem",
            "-days",
            "2",
            "-extfile",
            config,
            "-extensions",
            "leaf",
        )
        _openssl(
            directory,
            "pkcs12",
            "-export",
            "-in",
            f"{name}.pem",
            "-inkey",
            f"{name}.key",
            "-out",
            f"{name}.p12",
            "-passout",
            f"pass:{password}",
        )
        paths[role] = os.path.join(directory, f"{name}.p12")
    ssl_json = os.path.join(directory, "cluster_ssl.json")
    with open(ssl_json, "w") as stream:
        json.dump(
            {
                "server_cert_path": paths["server"],
                "client_cert_path": paths["client"],
                "ca_cert_path": os.path.join(directory, "cluster_ca.pem"),
                "crl_path": "",
                "cipher_list": "ECDHE-RSA-AES128-GCM-SHA256:ECDHE-RSA-AES256-GCM-SHA384",
                "cert_expire_warning_time_in_day": 7,
            },
            stream,
        )
    return {
        "MS_SERVING_CLUSTER_SSL_CONFIG": ssl_json,
        "MS_SERVING_CLUSTER_SERVER_PASSWORD": CLUSTER_PASSWORDS["server"],
        "MS_SERVING_CLUSTER_CLIENT_PASSWORD": CLUSTER_PASSWORDS["client"],
    }
